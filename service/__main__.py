from service.launch import main

raise SystemExit(main())
