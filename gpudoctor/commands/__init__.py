"""The click modules of gpudoctor's commands: ``gpudoctor.commands.<command>`` for each.

``check``, ``fix``, ``weights``, ``bench`` (with ``bench_report`` for ``bench report`` and
``bench compare``) and ``list``; ``options`` holds the options that check and fix share.
The root group (:mod:`gpudoctor.cli`) imports a command's module only when it is invoked.
"""
