from service.local_kafka.cli import main

raise SystemExit(main(prog="python -m service.local_kafka"))
