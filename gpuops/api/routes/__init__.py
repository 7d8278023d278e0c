"""The API's routes, one module per resource; each exposes ``router`` (an ``APIRouter``)."""
