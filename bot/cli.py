"""The `fusebot` command. Each subcommand lives in the module that does its work and is imported only when run,
so `fusebot serve` never imports torch and `fusebot eval` never imports the GitHub side.

This module also gives every subcommand `-h` beside `--help`, prints `--version`, and checks `fusebot serve`'s
settings before the server starts, naming the environment variable of each missing or invalid one.
"""

from __future__ import annotations

import importlib
import re
import sys
from typing import Annotated, Any

import typer
from pydantic import AliasChoices, ValidationError

from bot.web.settings import Settings
from runner.contract import ExitStatus
from runner.version import fusebot_version

HELP_OPTIONS = ["-h", "--help"]

# name -> (module:attribute of a Typer app, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("bot.demo:app", "Run the whole flow on a local repository made from examples/: no GitHub, no LLM."),
    "eval": ("runner.cli.eval:eval_app", "Verify and time one candidate kernel against a reference problem."),
    "optimize": ("runner.cli.optimize:optimize_app", "Search for a faster kernel for one module and write the result folder."),
    "bench": ("runner.cli.bench:bench_app", "Run optimize over every problem in a folder and write a benchmark table."),
    "serve": ("bot.web.server:app", "Run the GitHub App's web service (webhooks, runner API)."),
    "worker": ("runner.cli.worker:app", "Lease jobs from a fusebot bot and run them on this GPU host."),
    "action": ("bot.action.entry:app", "Entry point of the GitHub Action (reads GITHUB_EVENT_PATH)."),
}

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  context_settings={"help_option_names": HELP_OPTIONS},
                  help="fusebot: verified fused kernels as pull requests.\n\n"
                       "Run `fusebot COMMAND -h` for a command's options.")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"fusebot {fusebot_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[bool, typer.Option("--version", help="Print fusebot's version and exit.", is_eager=True,
                                               callback=_print_version)] = False,
) -> None:
    pass


def env_var(field: str) -> str:
    """The environment variable a Settings field is read from (the first alias, where it has several)."""
    info = Settings.model_fields.get(field)
    if info is None:  # pydantic names an aliased field by its alias
        return field
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        return str(alias.choices[0])
    return f"{Settings.model_config.get('env_prefix', '')}{field}".upper()


def settings_problems(e: ValidationError) -> list[str]:
    """One line per problem, each naming its environment variable (and no value: inputs are hidden)."""
    names = re.compile(r"\b(" + "|".join(sorted(Settings.model_fields, key=len, reverse=True)) + r")\b")
    out = []
    for err in e.errors():
        loc = [str(p) for p in err["loc"]]
        msg = names.sub(lambda m: env_var(m.group(1)), err["msg"].removeprefix("Value error, "))
        if not loc:
            out.append(msg)
            continue
        where = env_var(loc[0]) + (f" ({'.'.join(loc[1:])})" if len(loc) > 1 else "")
        if err["type"] == "missing":
            out.append(f"{where} is not set")
        else:
            out.append(msg if msg.startswith(where) else f"{where}: {msg}")
    return out


def check_serve_settings() -> None:
    """`fusebot serve` without its settings stops here, before the server imports, with one line per variable."""
    try:
        Settings()  # type: ignore[call-arg]
    except ValidationError as e:
        for line in settings_problems(e):
            typer.echo(typer.style("error", fg="red", bold=True) + ": " + line, err=True)
        typer.echo("fusebot serve reads its settings from FUSEBOT_* environment variables: README.md, "
                   "\"Running the bot\"; every setting: docs/bot.md", err=True)
        raise typer.Exit(ExitStatus.USAGE) from None


def _forward(name: str, target: str, help_text: str) -> None:
    @app.command(
        name=name,
        help=help_text,
        add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def _cmd(ctx: typer.Context) -> None:
        args = list(ctx.args)
        if name == "serve" and not set(HELP_OPTIONS) & set(args):
            check_serve_settings()
        module_name, attr = target.split(":")
        sub = getattr(importlib.import_module(module_name), attr)
        extra: dict[str, Any] = {"help_option_names": HELP_OPTIONS}
        sub(args=args, prog_name=f"fusebot {name}", **extra)


for _name, (_target, _help) in COMMANDS.items():
    _forward(_name, _target, _help)


def main() -> None:
    app(prog_name="fusebot")


if __name__ == "__main__":
    main()
    sys.exit(0)
