"""Stage 2: composite Relax operators -> primitive operators of six kinds (operator fission)."""
