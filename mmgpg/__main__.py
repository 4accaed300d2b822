from mmgpg.cli import main

raise SystemExit(main())
