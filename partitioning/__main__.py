import sys

from partitioning.cli import main

sys.exit(main())
