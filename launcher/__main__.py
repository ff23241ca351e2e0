import sys

from launcher.watch import main

sys.exit(main())
