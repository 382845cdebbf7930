"""Multi-step jobs that run converters and then checks (the round trip)."""
