"""Real models written against refcore op names (demonstrations and integration tests)."""
