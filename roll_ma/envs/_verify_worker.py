"""Child process of `MathVerifier`: runs math_verify on JSON lines from stdin.

Started by path (`python _verify_worker.py MEMORY_MB`), so it imports neither roll_ma nor the
caller's main module. Protocol: it prints `{"ready": true}` once math_verify is imported,
then answers each request line `{"pred": str, "gold": str}` with `{"correct": bool}` or
`{"error": str}`. It exits when stdin closes (the parent is gone). The parent kills it when
a request runs past its time limit.
"""

import json
import logging
import os
import sys


def main() -> None:
    memory_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    if memory_mb > 0:
        import resource

        # why: a huge power like 9^(9^9) must hit MemoryError, not swap the machine
        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr  # why: nothing a library prints may corrupt the protocol
    logging.disable(logging.CRITICAL)
    from math_verify import parse, verify

    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            # why: timeouts off (signal.alarm is unusable here); the parent enforces the limit
            gold = parse("\\boxed{" + request["gold"] + "}", parsing_timeout=None)
            pred = parse("\\boxed{" + request["pred"] + "}", parsing_timeout=None)
            correct = bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=None))
            response: dict[str, bool | str] = {"correct": correct}
        except Exception as e:  # noqa: BLE001 - MemoryError, RecursionError, sympy errors
            response = {"error": repr(e)[:200]}
        out.write(json.dumps(response) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
