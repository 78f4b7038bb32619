"""The results web UI under ``/ui``: server-rendered pages over the batch and run services,
signed in with a Spar token kept in an HttpOnly cookie (see ``docs/ui.md``)."""
