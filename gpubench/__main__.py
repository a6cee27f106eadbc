import sys

from gpubench.cli.main import main

sys.exit(main())
