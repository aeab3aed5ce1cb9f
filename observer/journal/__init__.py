"""The local journal: exchanges made durable on disk before the database sees them
(``journal``), its byte format (``format``) and what a start after a crash makes of it
(``recovery``)."""
