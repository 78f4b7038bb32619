"""``python -m api.cli``: the ``spar`` command (what ``spar demo`` starts ``spar dev`` with)."""

from api.cli import main

main()
