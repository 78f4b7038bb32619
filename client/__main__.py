"""``python -m client``: the ``spar`` command (what ``spar demo`` starts ``spar dev`` with)."""

from client.cli import main

main()
