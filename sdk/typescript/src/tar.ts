// A ustar archive (POSIX.1-1988) in memory, both ways: enough for GNU tar in a guest to
// unpack what uploadDir sends, and for downloadDir to unpack what `tar --format=ustar -c`
// sends back, trusting nothing in it.
import { lstatSync, mkdirSync, readFileSync, readdirSync, readlinkSync, symlinkSync, unlinkSync,
         writeFileSync, chmodSync } from "node:fs";
import { join, sep } from "node:path";

const BLOCK = 512;

function header(name: string, type: string, mode: number, size: number, mtime: number, link = ""): Buffer {
  const h = Buffer.alloc(BLOCK);
  let prefix = "";
  if (Buffer.byteLength(name) > 100) {
    const cut = name.lastIndexOf("/", 155);
    if (cut <= 0 || Buffer.byteLength(name.slice(cut + 1)) > 100)
      throw new Error(`a file name too long for a tar archive: ${name}`);
    prefix = name.slice(0, cut);
    name = name.slice(cut + 1);
  }
  const octal = (v: number, width: number, at: number) =>
    h.write(v.toString(8).padStart(width - 1, "0") + "\0", at, "ascii");
  h.write(name, 0);
  octal(mode & 0o7777, 8, 100);
  octal(0, 8, 108);
  octal(0, 8, 116);
  octal(size, 12, 124);
  octal(Math.max(0, Math.floor(mtime)), 12, 136);
  h.fill(" ", 148, 156);
  h.write(type, 156, "ascii");
  h.write(link, 157);
  h.write("ustar\0" + "00", 257, "ascii");
  h.write("root", 265);
  h.write("root", 297);
  h.write(prefix, 345);
  let sum = 0;
  for (const b of h) sum += b;
  h.write(sum.toString(8).padStart(6, "0") + "\0 ", 148, "ascii");
  return h;
}

/** Every file, link and directory under dir, as one archive. */
export function pack(dir: string): Buffer {
  const parts: Buffer[] = [];
  const walk = (rel: string) => {
    for (const entry of readdirSync(join(dir, rel)).sort()) {
      const name = rel ? `${rel}/${entry}` : entry;
      const full = join(dir, name);
      const st = lstatSync(full);
      if (st.isSymbolicLink())
        parts.push(header(name, "2", 0o777, 0, st.mtimeMs / 1000, readlinkSync(full)));
      else if (st.isDirectory()) {
        parts.push(header(name + "/", "5", st.mode, 0, st.mtimeMs / 1000));
        walk(name);
      } else if (st.isFile()) {
        const data = readFileSync(full);
        parts.push(header(name, "0", st.mode, data.length, st.mtimeMs / 1000), data,
                   Buffer.alloc((BLOCK - (data.length % BLOCK)) % BLOCK));
      }
    }
  };
  walk("");
  parts.push(Buffer.alloc(2 * BLOCK));
  return Buffer.concat(parts);
}

const field = (b: Buffer, at: number, width: number) => {
  const end = b.indexOf(0, at);
  return b.toString("utf8", at, end < 0 || end > at + width ? at + width : end);
};
const num = (b: Buffer, at: number, width: number) => parseInt(field(b, at, width).trim() || "0", 8);

/** Unpacks under dir: refuses absolute names, "..", devices, and anything that would be
 *  written through a link (links are made last). The number of files written. */
export function unpack(data: Buffer, dir: string): number {
  mkdirSync(dir, { recursive: true });
  const links: Array<[string, string]> = [];
  let files = 0;
  const throughLink = (name: string) => {
    const parts = name.split("/");
    for (let i = 1; i < parts.length; i++) {
      try {
        if (lstatSync(join(dir, ...parts.slice(0, i))).isSymbolicLink()) return true;
      } catch { /* not there yet */ }
    }
    return false;
  };
  for (let at = 0; at + BLOCK <= data.length;) {
    const h = data.subarray(at, at + BLOCK);
    if (h.every((b) => b === 0)) break;
    let sum = 0;
    for (let i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? 32 : h[i];
    if (num(h, 148, 8) !== sum) throw new Error(`not a tar archive (bad header at byte ${at})`);
    const size = num(h, 124, 12), type = String.fromCharCode(h[156] || 48);
    const prefix = field(h, 345, 155);
    let name = (prefix ? prefix + "/" : "") + field(h, 0, 100);
    const body = data.subarray(at + BLOCK, at + BLOCK + size);
    at += BLOCK + Math.ceil(size / BLOCK) * BLOCK;
    name = name.replace(/^(\.\/)+/, "").replace(/\/+$/, "");
    if (!name || name === ".") continue;
    const parts = name.split("/");
    if (name.startsWith("/") || parts.includes("..") || parts.includes(""))
      throw new Error(`refused: the archive names ${name}, outside the target`);
    if (throughLink(name)) throw new Error(`refused: ${name} lies through a symbolic link`);
    const full = join(dir, ...parts);
    const mode = num(h, 100, 8) & 0o777;
    if (type === "5") mkdirSync(full, { recursive: true, mode: mode | 0o700 });
    else if (type === "0" || type === "7") {
      mkdirSync(join(dir, ...parts.slice(0, -1)), { recursive: true });
      try { unlinkSync(full); } catch { /* none */ }
      writeFileSync(full, body, { flag: "wx", mode });
      chmodSync(full, mode);
      files++;
    } else if (type === "2") links.push([full, field(h, 157, 100)]);
    else throw new Error(`refused: ${name} is not a file, a directory or a link`);
  }
  for (const [full, target] of links) {
    if (throughLink(full.slice(dir.length + 1).split(sep).join("/")))
      throw new Error(`refused: the link ${full} lies through a link`);
    try { unlinkSync(full); } catch { /* none */ }
    symlinkSync(target, full);
  }
  return files;
}
