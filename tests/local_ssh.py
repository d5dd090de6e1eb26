"""Stands in for `ssh HOST COMMAND` in the preflight fan-out tests ($WIZARD_SSH): there is no sshd on this box, so
the command runs here, through a shell as sshd would run it. Everything else of the fan-out is real: the main node
builds the command line, starts it, and the started preflight meets the main one over TCP.

The options ssh takes with a value are skipped with their value, the others alone; the first word left is the host,
and it is exported as LOCAL_SSH_HOST so a test can see which host a node was started as.
"""

import os
import sys

WITH_VALUE = set("BbcDEeFIiJLlmOoPpQRSWw")


def main(argv: list[str]) -> int:
    i = 0
    while i < len(argv) and argv[i].startswith("-") and len(argv[i]) > 1:
        flag = argv[i]
        i += 2 if (len(flag) == 2 and flag[1] in WITH_VALUE) else 1
    if i >= len(argv) - 1:
        print("local_ssh: usage: local_ssh [options] HOST COMMAND", file=sys.stderr)
        return 255
    os.environ["LOCAL_SSH_HOST"] = argv[i]
    os.execvp("bash", ["bash", "-c", " ".join(argv[i + 1:])])
    return 255


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
