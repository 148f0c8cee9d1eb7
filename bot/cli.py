"""The `fusebot` command. Each subcommand lives in the module that does its work and is imported only when run,
so `fusebot serve` never imports torch and `fusebot eval` never imports the GitHub side."""

from __future__ import annotations

import importlib
import sys

import typer

# name -> (module:attribute of a Typer app, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("bot.demo:app", "Run the whole flow on a local repository made from examples/: no GitHub, no LLM."),
    "eval": ("runner.cli.eval:eval_app", "Verify and time one candidate kernel against a reference problem."),
    "optimize": ("runner.cli.optimize:optimize_app", "Search for a faster kernel for one problem and write the result folder."),
    "bench": ("runner.cli.bench:bench_app", "Run optimize over every problem in a folder and write a benchmark table."),
    "serve": ("bot.web.server:app", "Run the GitHub App's web service (webhooks, runner API)."),
    "worker": ("runner.cli.worker:app", "Lease jobs from a fusebot bot and run them on this GPU host."),
    "action": ("bot.action.entry:app", "Entry point of the GitHub Action (reads GITHUB_EVENT_PATH)."),
}

app = typer.Typer(no_args_is_help=True, add_completion=False, help="fusebot: verified fused kernels as pull requests.")


def _forward(name: str, target: str, help_text: str) -> None:
    @app.command(
        name=name,
        help=help_text,
        add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def _cmd(ctx: typer.Context) -> None:
        module_name, attr = target.split(":")
        sub = getattr(importlib.import_module(module_name), attr)
        sub(args=list(ctx.args), prog_name=f"fusebot {name}")


for _name, (_target, _help) in COMMANDS.items():
    _forward(_name, _target, _help)


def main() -> None:
    app(prog_name="fusebot")


if __name__ == "__main__":
    main()
    sys.exit(0)
