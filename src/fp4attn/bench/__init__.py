"""Benchmarks: ``fp4attn bench NAME`` runs ``fp4attn.bench.NAME.main(argv)``.

:mod:`fp4attn.bench.common` holds the shared timing, table, CSV and PNG helpers.
"""
