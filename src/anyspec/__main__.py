from anyspec.cli import main

raise SystemExit(main())
