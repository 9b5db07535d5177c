"""``python -m gpudoctor``: the same as the ``gpudoctor`` command."""

if __name__ == "__main__":
    # entry.main starts `check`'s GPU probe before click is imported, then runs the CLI
    from gpudoctor.entry import main

    main()
