"""The `durably` command line (api.md §6). Entry point: `durably._cli.main:main`."""
