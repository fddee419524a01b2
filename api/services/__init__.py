"""The API's logic; the blueprints only parse requests and shape replies."""
