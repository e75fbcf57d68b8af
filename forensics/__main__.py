from forensics.cli import main

raise SystemExit(main())
