"""python -m regressions list | matrix | new <id> ..."""

from regressions.cli import main

raise SystemExit(main())
