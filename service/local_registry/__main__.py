from service.local_registry.cli import main

raise SystemExit(main(prog="python -m service.local_registry"))
