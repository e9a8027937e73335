import sys

from partrain_edu.cli import main

sys.exit(main())
