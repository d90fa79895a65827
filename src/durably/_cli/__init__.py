"""The `durably` command line. Entry point: `durably._cli.main:main`."""
