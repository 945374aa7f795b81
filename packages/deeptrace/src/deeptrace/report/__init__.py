"""The outputs of `deeptrace analyze`: report.json (schema), terminal, Markdown, PNG, merged Perfetto trace."""
