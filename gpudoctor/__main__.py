"""``python -m gpudoctor``: the same as the ``gpudoctor`` command."""

if __name__ == "__main__":
    # early_probe.run starts `check`'s GPU probe before click is imported, then runs the CLI
    from gpudoctor.early_probe import run

    run()
