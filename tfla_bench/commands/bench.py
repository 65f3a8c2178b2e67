"""CLI commands: placeholder until this group's issue lands."""

import typer


def register(app: typer.Typer) -> None:
    """Add this group's commands to the main app."""
