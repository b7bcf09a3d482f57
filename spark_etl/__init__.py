"""Warehouse load of the B2B gateway: delivered UBL documents -> Parquet facts.

A PySpark 4 job (local mode by default, any master by configuration or
``spark-submit``) reads the documents delivered (status ``delivered`` or
``replied``) since the last successful run from the ledger tables
(:mod:`ledger_contract.tables`, SQLite or PostgreSQL), parses them and writes a
Parquet warehouse (default ``./var/warehouse/``):

=====================  ======================================================
``fact_order``         one row per UBL Order (ids, partner, buyer, seller,
                       issue date, currency, totals, and its current state
                       under the correction rule below)
``fact_order_line``    one row per OrderLine of an Order or an OrderChange
``fact_order_change``  one row per OrderChange / OrderCancellation
``fact_invoice``       one row per UBL Invoice
``fact_invoice_line``  one row per InvoiceLine
``dim_partner``        one row per ledger partner
``dim_date``           one row per day from the first to the last issue date
=====================  ======================================================

Fact tables are partitioned by ``issue_date``; every fact row carries the
``message_id`` of the ledger document it came from and its ``ledger_seq``.
Other delivered document types (DespatchAdvice, OrderResponse...) are counted
as *skipped*; a document that cannot be parsed goes to the ``etl_quarantine``
table with the reason, and the night goes on.

Each document's fields are extracted ONCE, by :mod:`ledger_contract.facts`: at
intake by the gateway (stored in ``b2b_ledger.facts``, which the load reads in
bulk), or here from the stored XML when a document has no current facts (and
for every document with ``--reparse``).

Two read paths: in local mode with a local warehouse the driver stages the
window with Arrow (:mod:`~spark_etl.stage`: new fact rows as Parquet, one file
per table and date, published as they are when nothing else goes into their
partitions); elsewhere (a cluster) the executors read it with the Python Data
Source and Spark does the rest. Both give the same warehouse.

Modules: :mod:`~spark_etl.ubl` (facts and XML to Arrow batches), :mod:`~spark_etl.source`
(load window, Python Data Source reader), :mod:`~spark_etl.stage` (the Arrow
staging, read-back and dimensions of the local path), :mod:`~spark_etl.warehouse`
(tables, transforms, correction rule, publishing), :mod:`~spark_etl.job` (the
run: reconciliation, watermark), :mod:`~spark_etl.state` (runs, quarantine,
lock), :mod:`~spark_etl.scheduler` (nightly APScheduler job),
:mod:`~spark_etl.cli` (``b2bgw etl``, ``python -m spark_etl``).

Correction rule (OrderChange, OrderCancellation)
------------------------------------------------
An OrderChange or OrderCancellation refers to an order by its
``cac:OrderReference/cbc:ID``. The **order key** is ``(partner, order id)``:
the ledger partner that sent the document and the order's ``cbc:ID`` (order
ids are only unique per trading partner). For every key, the warehouse holds
the result of applying all the key's documents known so far:

1. The *effective order* is the key's Order with the highest ``ledger_seq``
   (the last one delivered). If an Order is sent again under the same id,
   the earlier one gets ``status = 'replaced'``, current amounts 0, and its
   lines ``is_current = false`` with ``superseded_by`` = the effective
   order's message id.
2. The key's OrderChanges and OrderCancellations apply to the effective order
   in delivery order (``ledger_seq``), whatever their own dates or sequence
   numbers say, and also when they were delivered before the Order.
3. Lines are matched by ``cbc:ID`` (LineItem/ID). A change line replaces the
   current version of the line with the same id, or adds it when there is
   none; a change line whose ``cbc:LineStatusCode`` is ``Cancelled`` voids it
   (that change line is recorded but not current). Lines a change does not
   mention are unchanged. Exactly the last version of each line is
   ``is_current``; each older version has ``superseded_by`` = the message id
   of the document that replaced it.
4. An OrderCancellation voids the order: ``status = 'cancelled'``,
   ``cancel_message_id`` = the first cancellation delivered, no line is
   current (their ``superseded_by`` is the cancellation), current amounts 0.
   Cancellation is final: later changes are recorded but do not revive it.
5. Otherwise ``status`` is ``'changed'`` when at least one OrderChange
   applied (``revision`` = how many; ``last_change_message_id``), else
   ``'open'``. ``current_line_count`` / ``current_line_extension_amount`` are
   recomputed from the current lines; ``current_payable_amount`` is the
   PayableAmount last declared (by the order or by a change that carries an
   ``AnticipatedMonetaryTotal``).
6. A change whose order is not in the warehouse (yet) is kept in
   ``fact_order_change`` with ``applied = false`` and its lines not current.
   When the order arrives - in a later run, or never - the rule is applied
   again to all the key's documents: the change then applies
   (``applied = true``, ``applied_to_message_id``). Because the result only
   depends on the set of documents of a key, never on which run brought which
   document, a full rebuild (``--full``) gives the same warehouse as the
   incremental history.

The as-issued columns (``line_count``, ``line_extension_amount``,
``payable_amount``...) of ``fact_order`` never change: they are what the
document said, and what reconciliation compares with the ledger.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
