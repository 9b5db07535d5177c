"""``python -m gpudoctor``: the same as the ``gpudoctor`` command."""

from gpudoctor.cli import run

if __name__ == "__main__":
    run()
