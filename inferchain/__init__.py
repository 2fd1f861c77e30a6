"""Project wiring: settings, URL root, ASGI app and demo seeding. It imports every app; nothing imports it."""
