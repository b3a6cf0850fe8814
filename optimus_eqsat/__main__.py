import sys

from optimus_eqsat.cli import main

sys.exit(main())
