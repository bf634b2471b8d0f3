"""``python -m ddlctl`` is the same as the ``ddlctl`` command."""

from ddlctl.cli import main

if __name__ == "__main__":
    main()
