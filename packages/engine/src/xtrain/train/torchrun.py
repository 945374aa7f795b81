"""torchrun, as ``xtrain train --nproc N`` starts it: torch's own launcher, with a quieter failure report.

Runs ``torch.distributed.run`` with the arguments given. When a rank fails, torchrun's report (a traceback of the
launcher itself plus a table) says nothing the ranks have not said already; here the launcher's own logging is
silenced and a failure becomes one line naming the ranks and their exit codes (a rank's own output, traceback
included, still reaches the terminal). A rank's exit code 2 (a user
error it reported) is passed on as the job's exit code.
"""

from __future__ import annotations

import logging
import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run


def main(argv: list[str] | None = None) -> int:
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        run(parse_args(sys.argv[1:] if argv is None else argv))  # type: ignore[no-untyped-call]  # torch.distributed.run is untyped
    except ChildFailedError as failed:
        codes = {rank: failure.exitcode for rank, failure in sorted(failed.failures.items())}
        if any(code == 2 for code in codes.values()):
            return 2
        listed = ", ".join(f"rank {rank}: exit code {code}" for rank, code in codes.items())
        print(f"xtrain: training failed ({listed}); see each rank's output above and RUN_DIR/logs/", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
