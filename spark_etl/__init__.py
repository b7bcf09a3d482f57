"""Warehouse load of the B2B gateway: delivered UBL documents -> Parquet facts.

A PySpark job (local mode by default, any master by configuration or
``spark-submit``) reads the documents delivered since the last successful
run from the ledger (:mod:`ledger_contract.tables`), and writes the fact
tables ``fact_order``, ``fact_order_line``, ``fact_order_change``,
``fact_invoice``, ``fact_invoice_line`` (partitioned by ``issue_date``, each
row with its document's ``message_id`` and ``ledger_seq``) and the
dimensions ``dim_partner`` and ``dim_date``. Other document types are
skipped; a document that cannot be read goes to ``etl_quarantine``.

A document's fields are extracted once, by :mod:`ledger_contract.facts`: at
intake (``b2b_ledger.facts``), or here from the stored XML when it has no
current facts. Locally the driver stages the window with Arrow
(:mod:`~spark_etl.stage`); on a cluster the executors read it through the
Python Data Source (:mod:`~spark_etl.source`). Both give the same warehouse.

OrderChanges and OrderCancellations apply to the order of the same key
``(partner, direction, order id)`` under the correction rule (:mod:`~spark_etl.warehouse`,
stated in docs/data-guide.md): a key's rows depend only on the set of its
documents, so a full rebuild equals the incremental history.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
