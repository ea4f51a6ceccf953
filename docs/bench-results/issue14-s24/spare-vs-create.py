# On this machine's journal-less ext4: after 5,000 files of 32 KiB are made and deleted in a
# directory (as an RW-PCC cache does), the cost of creating a file there against renaming a
# file made beforehand (elsewhere) into it and opening it. docs/benchmarks.md, issue 14 s24.
import os, time, shutil
base = '/var/tmp/spare-exp'; shutil.rmtree(base, ignore_errors=True)
d = base + '/data'; s = base + '/spare'; os.makedirs(d); os.makedirs(s)
for i in range(500):
    os.close(os.open(f'{s}/{i}', os.O_RDWR | os.O_CREAT, 0o600))
for i in range(5000):
    fd = os.open(f'{d}/c{i}', os.O_RDWR | os.O_CREAT, 0o600); os.write(fd, b'x' * 32768); os.close(fd)
for i in range(5000):
    os.unlink(f'{d}/c{i}')
t = time.perf_counter()
for i in range(500):
    fd = os.open(f'{d}/n{i}', os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600); os.close(fd)
a = (time.perf_counter() - t) / 500 * 1e6
t = time.perf_counter()
for i in range(500):
    os.rename(f'{s}/{i}', f'{d}/r{i}'); fd = os.open(f'{d}/r{i}', os.O_RDWR | os.O_TRUNC); os.close(fd)
b = (time.perf_counter() - t) / 500 * 1e6
print(f'after 5000 files made and deleted there: create {a:.0f} us, rename of a spare + open {b:.0f} us')
shutil.rmtree(base)
