# The collector image: logitwatch[server,postgres], no torch.
FROM python:3.11-slim
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir ".[server,postgres]"
EXPOSE 8000
CMD ["logitwatch", "serve", "--host", "0.0.0.0", "--port", "8000"]
