"""python -m fmha.regressions list | matrix | new <id> ..."""

from fmha.regressions.cli import main

raise SystemExit(main())
