"""Built-in mmgpg task plugins (installed as the package ``mmgpg_tasks``; registered under ``mmgpg.tasks``)."""
