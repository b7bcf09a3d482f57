"""``python -m spark_etl run|status ...``: the load without the gateway."""

import sys

from spark_etl.cli import main

if __name__ == "__main__":
    sys.exit(main())
