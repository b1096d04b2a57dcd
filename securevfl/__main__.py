import sys

from securevfl.cli import main

sys.exit(main())
