"""`python -m durably …` is the `durably` command (for environments without the script)."""

from durably._cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
