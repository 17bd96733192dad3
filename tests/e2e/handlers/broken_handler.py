def handle(data, context):
    if data is None:
        raise RuntimeError("this model cannot load: weights are missing")
    return data
