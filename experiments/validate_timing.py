"""Check the suite's clock against Nsight Compute and back-to-back CUDA graphs
(see tfla_bench.measure.validation).

python experiments/validate_timing.py [OUT]
"""

import sys

from tfla_bench.measure.validation import main

if __name__ == "__main__":
    sys.exit(main())
