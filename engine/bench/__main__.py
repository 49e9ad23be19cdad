import sys

from engine.bench import main

sys.exit(main())
