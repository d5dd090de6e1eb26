from wizard.frontends.cli import main

raise SystemExit(main())
