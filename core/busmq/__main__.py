"""``python -m busmq``: the ``busmq`` command line (:mod:`busmq.cli`)."""

from .cli import main

if __name__ == "__main__":
    main()
