import sys

from fmha.bench.dense import main

sys.exit(main())
