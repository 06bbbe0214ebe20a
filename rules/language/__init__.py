"""The Lookout rule language: grammar, parser, checker, compiler and CLI."""
