"""``python -m fp4attn``: the ``fp4attn`` command."""

from .cli import main

raise SystemExit(main())
