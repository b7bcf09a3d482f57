"""``python -m spark_etl run|status ...``: the load without the gateway.

Also the ``spark-submit`` entry point: ``spark-submit ... spark_etl/__main__.py run ...``.
"""

import sys

from spark_etl.cli import main

if __name__ == "__main__":
    sys.exit(main())
