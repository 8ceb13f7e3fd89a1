"""DLRover-RM's pipeline integrations, under one importable name so nothing shadows a user's
own packages (Airflow puts the DAGs folder, often holding ``operators/`` or ``components/``
folders, on ``sys.path``):

- :mod:`dlrover_rm.operators`: the Airflow provider (hook, operators, triggers;
  ``get_provider_info`` behind the ``apache_airflow_provider`` entry point);
- :mod:`dlrover_rm.components`: the Kubeflow Pipelines components;
- :mod:`dlrover_rm.pipelines`: the example pipelines and specs.

In a checkout they are the top-level ``operators/``, ``components/`` and ``pipelines/``
folders, installed under this name by pyproject's ``package-dir`` mapping (an editable install
maps them too).

The core they shell over is :mod:`dlrover_core` (no Airflow or KFP import in it).
"""
