"""Reporting an audit: the result, its report files (JSON, Markdown, HTML, JUnit, SARIF), baselines,
redaction and exports."""
