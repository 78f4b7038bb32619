FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY api ./api
COPY client ./client
COPY workers ./workers
COPY scheduler ./scheduler
COPY shared ./shared
RUN pip install --no-cache-dir ".[server]" && useradd --system --uid 10001 spar
USER spar
EXPOSE 8000
CMD ["spar", "serve", "--host", "0.0.0.0", "--port", "8000"]
