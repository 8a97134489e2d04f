from ..cli.client import main

raise SystemExit(main())
