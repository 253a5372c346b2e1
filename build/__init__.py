"""Build step: catalogue -> validate -> export weights -> model_store/<name>.mar."""
